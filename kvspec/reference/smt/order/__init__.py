"""Eviction order over an encoded recency order (ORDER-* rows of ``kvspec prove``)."""
