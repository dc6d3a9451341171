"""Reading, exporting and verifying DeepSpeed ZeRO checkpoints (`zeropilot ckpt`).

Modules (import the one you need; only ``layout`` is torch-free):

* ``names``: DeepSpeed's and the HF Trainer's checkpoint file and folder names, spelled only there.
* ``layout``: the folder layout built on those names;
  ``read_layout(path) -> CheckpointLayout`` (tag, stage, world size, rank files present, missing,
  empty or truncated, HF/PEFT files beside). Imports no torch: ``zeropilot check`` uses it.
* ``safe_load``: ``torch.load(weights_only=True)`` with the DeepSpeed allowlist.
* ``reconstruct``: where each tensor lives in the rank files; reads one tensor at a time.
* ``safetensors_writer``, ``export``, ``inspect``, ``verify``: the three commands.
"""
