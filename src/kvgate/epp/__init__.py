"""``kvgate epp``: the Gateway API Inference Extension's Endpoint Picker over Envoy ext_proc.

A third driver of the request pipeline (beside the proxy of ``kvgate serve`` and the
simulator): Envoy moves the bytes, the picker admits, routes and learns from each
request's stream of ext_proc messages (``kvgate.epp.stream``).
"""
