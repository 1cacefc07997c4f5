"""A Rust port (std only) of SGLang-style radix prefix cache over protocol version 4 (main.rs)."""
