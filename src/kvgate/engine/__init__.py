"""The simulated engine (execution layer): paged KV cache, continuous batching, profiles.

``EngineCore`` is a plain object driven by virtual time (``advance_to``); the aiohttp
server in ``server.py`` drives it in real time and the cluster simulator in virtual time.
"""
