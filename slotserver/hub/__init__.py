"""Models from the Hugging Face hub, as llama.cpp gets them: cache.py reads the hub cache (the
router's `--models-cache`, `-hf` offline), download.py fills it (`-hf`, `-hff`, `-hft`). Imports no torch."""
