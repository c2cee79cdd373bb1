"""Builds a tiny model directory for real vLLM engines, offline, with no weights.

Run with the vLLM virtualenv's python (it needs `tokenizers`):
    python scripts/make_tiny_vllm_model.py DIR

DIR gets a 2-layer LlamaForCausalLM config.json (hidden 256, vocab 8192), a byte-level BPE
tokenizer trained here on a seeded synthetic corpus (tokenizer.json), tokenizer_config.json and
a chat template (also as chat_template.jinja). vLLM serves it with --load-format dummy: random
weights, so the text is noise, but the scheduler, the paged KV cache, prefix caching, /metrics
and the chat template are vLLM's own. The output is the same on every run.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 8192
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|start|>", "<|end|>"]
BOS, EOS = "<s>", "</s>"

# Messages render as <|start|>ROLE\nCONTENT<|end|>\n after one BOS; tools as a "tools" block
# (JSON), assistant tool calls as JSON lines after the content.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}<|start|>tools\n{{ tools | tojson }}<|end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "<|start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- elif message['content'] %}"
    "{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{ part['text'] }}{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "\n{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "{%- endfor %}"
    "{%- endif %}"
    "<|end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant\n{%- endif %}"
)

WORDS_TEXT = (
    "the of and to in is you that it he was for on are as with his they at be this "
    "have from or one had by word but not what all were we when your can said there "
    "use an each which she do how their if will up other about out many then them "
    "these so some her would make like him into time has look two more write go see "
    "number no way could people my than first water been call who oil its now find "
    "long down day did get come made may part system user assistant request token "
    "cache prefix block engine model prompt reply route node gateway server latency "
    "queue memory batch decode prefill stream chat tool function answer question "
    "document summary context history turn message search weather city price"
)
WORDS = tuple(WORDS_TEXT.split())
SYLLABLES_TEXT = "ka ri to mo ne su la vi de po an el is or un ex al in er on at en es ra li"
SYLLABLES = tuple(SYLLABLES_TEXT.split())


def corpus(seed: int = 0, lines: int = 40_000) -> Iterator[str]:
    rng = random.Random(seed)
    for i in range(lines):
        words = []
        for _ in range(rng.randint(4, 24)):
            roll = rng.random()
            if roll < 0.6:
                words.append(rng.choice(WORDS))
            elif roll < 0.85:
                words.append("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))))
            elif roll < 0.95:
                words.append(str(rng.randint(0, 10_000)))
            else:
                words.append(rng.choice([",", ".", ":", "?", "!", "{", "}", '"', "(", ")"]))
        text = " ".join(words)
        yield text.capitalize() if i % 3 else text


def build(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    # Completions get one BOS, as Llama tokenizers do; chat renders its own BOS and vLLM
    # tokenizes the rendered text without special tokens.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    tok.save(str(out / "tokenizer.json"))
    if tok.get_vocab_size() > VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens > {VOCAB_SIZE}")

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": VOCAB_SIZE,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": tok.token_to_id("<pad>"),
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    generation_config = {"bos_token_id": bos_id, "eos_token_id": eos_id}
    special_tokens_map = {
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": "<unk>",
        "pad_token": "<pad>",
    }
    for name, body in (
        ("config.json", config),
        ("tokenizer_config.json", tokenizer_config),
        ("generation_config.json", generation_config),
        ("special_tokens_map.json", special_tokens_map),
    ):
        (out / name).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    print(f"make_tiny_vllm_model: {out} ({tok.get_vocab_size()} tokens)")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: make_tiny_vllm_model.py DIR", file=sys.stderr)
        return 2
    build(Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
