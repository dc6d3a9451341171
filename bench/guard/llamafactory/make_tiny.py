"""A tiny LLaMA-Factory SFT launch for CPU: random-weight Qwen2 (2 layers), a byte-level BPE tokenizer trained on
the data itself, 32 alpaca-style samples, LoRA on all linear layers, ZeRO-3 through LLaMA-Factory's own
``ds_z3_config.json`` shape (``"auto"`` values), gloo. Nothing is downloaded.

    python make_tiny.py DIR   -> DIR/model, DIR/data, DIR/ds_z3.json, DIR/train.yaml
Then (a venv with llamafactory 0.9.5, see README.md beside this file):
    DS_ACCELERATOR=cpu FORCE_TORCHRUN=1 NPROC_PER_NODE=2 zeropilot run --out RUN -- llamafactory-cli train DIR/train.yaml
"""
import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

WORDS = "the guard watches every rank of a zero launch and explains its out of memory errors and hangs".split()


def samples():
    out = []
    for i in range(32):
        w = WORDS[i % len(WORDS):] + WORDS[:i % len(WORDS)]
        out.append({"instruction": " ".join(w[:6]), "input": "", "output": " ".join(w[6:12])})
    return out


def main(root: Path) -> None:
    data = samples()
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "tiny.json").write_text(json.dumps(data))
    (root / "data" / "dataset_info.json").write_text(json.dumps({"tiny": {"file_name": "tiny.json"}}))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [d["instruction"] + " " + d["output"] for d in data] * 4
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|pad|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>")
    fast.save_pretrained(root / "model")
    cfg = AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=len(fast),
                               max_position_embeddings=256, eos_token_id=fast.eos_token_id,
                               pad_token_id=fast.pad_token_id, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(root / "model")
    # LLaMA-Factory's ds_z3_config.json also has "train_batch_size": "auto". Left out here: on CPU the HF Trainer
    # starts gloo itself and DeepSpeed's comm layer is not up when DeepSpeed checks the batch sizes, so it counts
    # world size 1 against HF's filled-in 2 and stops ("train_batch_size is not equal to ..."). CPU only.
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
          "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
          "zero_optimization": {"stage": 3, "overlap_comm": False, "contiguous_gradients": True,
                                "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                                "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                                "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                                "stage3_gather_16bit_weights_on_model_save": True}}
    (root / "ds_z3.json").write_text(json.dumps(ds, indent=2))
    yaml = f"""model_name_or_path: {root / 'model'}
stage: sft
do_train: true
finetuning_type: lora
lora_target: all
deepspeed: {root / 'ds_z3.json'}
dataset: tiny
dataset_dir: {root / 'data'}
template: default
cutoff_len: 64
overwrite_cache: true
preprocessing_num_workers: 1
output_dir: {root / 'out'}
logging_steps: 1
save_steps: 2
max_steps: 4
per_device_train_batch_size: 1
gradient_accumulation_steps: 1
learning_rate: 1.0e-4
use_cpu: true
ddp_backend: gloo
report_to: none
"""
    (root / "train.yaml").write_text(yaml)


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
