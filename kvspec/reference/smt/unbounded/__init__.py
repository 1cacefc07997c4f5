"""The kvbm offload encoding for any number of slots and hashes."""
