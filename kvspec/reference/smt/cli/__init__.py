"""``kvspec prove`` and ``kvspec witnesses``: options and the rows each profile prints."""
