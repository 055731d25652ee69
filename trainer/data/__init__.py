"""Text to batches: tokenizers, the file formats users upload (formats.py, records.py), the loss
spans of prompt/completion and chat data (spans.py), tokenized data with its cache (prepare.py) and
the batch sampler (batches.py)."""
