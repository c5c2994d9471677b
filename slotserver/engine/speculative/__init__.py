"""Speculative decoding: drafters propose tokens (n-grams of the context, or a draft model), the
target verifies them in one batched forward (speculator.py, verify.py; --spec-* flags)."""
