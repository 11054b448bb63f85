"""The Responses a server keeps, for `previous_response_id` and GET / DELETE /v1/responses/{id}.

OpenAI keeps a Response unless its body says `store: false`; a later body naming it as
`previous_response_id` continues its conversation: the earlier input and output come first,
then the new input (the earlier `instructions` do not carry over). Kept here in memory, as vLLM
keeps them, but bounded (vLLM's store is not): the newest `limit` of them (`--stored-responses`).
A restart forgets them all.
"""

from __future__ import annotations

from collections import OrderedDict

from linnet.serve.openai_api import ApiError


class ResponseStore:
    def __init__(self, limit: int = 1024):
        """`limit`: how many Responses are kept, the oldest dropped first; 0 keeps none."""
        self.limit = limit
        self.kept: OrderedDict = OrderedDict()  # id: (Response, its conversation as chat messages)

    def put(self, response: dict, conversation: list, input_items: list = ()) -> None:
        """Keeps `response`, whose conversation, its own output's turn included, is `conversation`,
        and whose body's input was `input_items`."""
        if self.limit <= 0:
            return
        self.kept[response["id"]] = (response, conversation, list(input_items))
        while len(self.kept) > self.limit:
            self.kept.popitem(last=False)

    def response(self, response_id: str) -> dict:
        if response_id not in self.kept:
            raise ApiError(404, f"no response with id {response_id!r}: it was never stored (store: false, or its "
                                f"client went away before it ended), was deleted, or was dropped, the oldest first, "
                                f"past the {self.limit} this server keeps",
                           code="not_found")
        return self.kept[response_id][0]

    def conversation(self, response_id) -> list:
        """The chat messages a body naming `response_id` as its previous response continues."""
        if not isinstance(response_id, str) or response_id not in self.kept:
            raise ApiError(400, f"previous response with id {response_id!r} not found", "previous_response_id",
                           "previous_response_not_found")
        return list(self.kept[response_id][1])

    def input_items(self, response_id: str) -> dict:
        """OpenAI's list of a kept Response's input items, in the order sent, each with an id."""
        self.response(response_id)  # a 404 where there is none
        items = self.kept[response_id][2]
        return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
                "last_id": items[-1]["id"] if items else None, "has_more": False}

    def delete(self, response_id: str) -> dict:
        self.response(response_id)  # a 404 where there is none
        del self.kept[response_id]
        return {"id": response_id, "object": "response", "deleted": True}
