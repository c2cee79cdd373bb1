"""Precise routing input: the engines' KV cache events (vLLM / SGLang wire format).

* ``wire``: the msgpack batch format and ZMQ framing; ``hashing``: engine-compatible block
  hashes; ``tokenizer``: prompt → token ids (``tokenizers``).
* ``index``: per node, the blocks the events say are cached; ``signal``: binds an index to
  a router's node view for policy ``precise``.
* ``publisher`` (engine-sim) and ``subscriber`` (gateway): the ZMQ ends, with sequence
  numbers, gap replay and restart resync.
"""
