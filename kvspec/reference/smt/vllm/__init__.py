"""The vllm profile in z3: copy counting, whole-Use operations, agreement."""
