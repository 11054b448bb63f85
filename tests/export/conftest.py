import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers must never reach for the network here
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
