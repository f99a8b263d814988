"""Generation engines: the `GenerationEngine` protocol (generation.py), transformers (transformers_engine.py
with decode.py, prefix_attention.py, kv_planner.py), vLLM, Ray and local sharding, and `make_engine` (make.py)."""
