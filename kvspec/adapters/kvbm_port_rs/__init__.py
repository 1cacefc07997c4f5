"""kvbm_port_rs: an independent Rust port of Dynamo's kvbm mocker KvManager (see README.md)."""
