"""Witness harness: run the real HF Trainer / DeepSpeed engine on CPU with tiny models.

``trainer_runs`` runs HF Trainer cases (save_only_model, gather, LoRA, resume) on N ranks in a subprocess
and reports the files each save wrote; ``engine_runs`` runs raw ``deepspeed.initialize`` scenarios
(rank-0-only saves, manual step skipping, process-group timeouts). Both are importable without torch;
torch, deepspeed and transformers are imported only inside the child processes.
"""
