"""Training: the PPO trainer (trainer.py), prefix packing (packing.py), the update backends and their
launcher (distributed.py), LoRA (lora.py) and the one checkpoint writer (saving.py)."""
