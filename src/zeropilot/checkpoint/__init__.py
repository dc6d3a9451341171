"""Reading, exporting and verifying DeepSpeed ZeRO checkpoints (`zeropilot ckpt`).

Modules (import the one you need; torch is imported only where values must be cast or computed):

* ``names``: DeepSpeed's and the HF Trainer's checkpoint file and folder names, spelled only there.
* ``layout``: the folder layout built on those names;
  ``read_layout(path) -> CheckpointLayout`` (tag, stage, world size, rank files present, missing,
  empty or truncated, HF/PEFT files beside). Imports no torch: ``zeropilot check`` uses it.
* ``torchzip``: ``torch.save`` archives read without torch and without running pickled code; tensors
  come back as byte ranges of their file (``StoredTensor``).
* ``safe_load``: the fallback, ``torch.load(weights_only=True)`` with the DeepSpeed allowlist.
* ``reconstruct``: where each tensor lives in the rank files; its pieces, read or copied on demand.
* ``safetensors_writer``, ``export``, ``inspect``, ``verify``: the three commands.
"""
