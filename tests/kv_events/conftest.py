"""A tiny tokenizer trained in the test session (tokenizers library, WordLevel)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from kvgate.tokens import _WORDS


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    corpus = [" ".join(_WORDS)] + [f"customer {i} document {i}" for i in range(200)]
    corpus += ["<|system|> <|user|> <|assistant|> tenant prompt question answer"]
    tok.train_from_iterator(corpus, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path
