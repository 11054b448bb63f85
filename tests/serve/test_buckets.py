"""JAX pass buckets: every pass fits one, warmup's list holds every one a run can meet, padding is bounded."""

from hypothesis import given
from hypothesis import strategies as st

from linnet.serve.runners import bucket, bucket_sizes


@given(st.integers(1, 4096), st.sampled_from([8, 16, 32]))
def test_a_pass_fits_its_bucket_and_warmup_lists_it(n, smallest):
    size = bucket(n, smallest)
    assert size >= max(n, smallest)
    assert size in bucket_sizes(n, smallest) and size in bucket_sizes(4096, smallest)


@given(st.integers(129, 4096))
def test_past_128_tokens_a_pass_pads_by_at_most_half_of_itself(n):
    assert bucket(n) <= n * 3 // 2 + 1


def test_sizes_are_powers_of_two_with_three_quarter_steps():
    assert bucket_sizes(512) == [16, 32, 64, 128, 192, 256, 384, 512]
    assert bucket_sizes(300) == [16, 32, 64, 128, 192, 256, 384]
    assert [bucket(n) for n in (1, 17, 128, 129, 193, 257, 385)] == [16, 32, 128, 192, 256, 384, 512]


def test_no_bucket_below_the_head_of_one_token_slots_is_listed():
    """Every JAX pass starts with a slot for each cache row (`head_tokens`): with 64 rows no pass is
    shorter than 64 tokens, and warmup compiles no 16- or 32-token shape."""
    from linnet.serve.runners import JaxRunner
    from tests.serve.conftest import make_model

    for rows, sizes in ((64, [64, 128, 192, 256, 384, 512]), (4, [16, 32, 64, 128, 192, 256, 384, 512]),
                        (100, [128, 192, 256, 384, 512])):
        assert JaxRunner(make_model("jax", rows=rows, max_seq=8)).pass_sizes(512) == sizes
