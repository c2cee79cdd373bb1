"""The Python floor: a bare aiohttp pass-through proxy (round-robin, no logic, uvloop).

python bench/bare_proxy.py --port-file F --backend http://127.0.0.1:9001 --backend ...
"""

from __future__ import annotations

import argparse
import itertools

import aiohttp
import uvloop
from aiohttp import web


async def serve(backends: list[str], port_file: str) -> web.AppRunner:
    nodes = itertools.cycle(backends)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": "application/json"}
        async with session.post(next(nodes) + request.path, data=body, headers=headers) as up:
            resp = web.StreamResponse(status=up.status)
            resp.content_type = up.content_type
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app = web.Application()
    app.router.add_post("/{path:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    with open(port_file, "w") as f:
        f.write(str(runner.addresses[0][1]))
    return runner


async def main(args: argparse.Namespace) -> None:
    import asyncio

    runner = await serve(args.backend, args.port_file)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", action="append", required=True)
    parser.add_argument("--port-file", required=True)
    uvloop.run(main(parser.parse_args()))
