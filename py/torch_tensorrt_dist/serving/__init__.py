"""``torchtrt-dist serve``: an OpenAI-compatible server over the tensor / expert-parallel ranks.

The ranks run the generation core (``generation/slots.py``) in step: rank 0 admits requests
into free KV-cache slots and announces each step's joins and cancels on a control channel
(``control.py``); every rank then runs the same prefills and one decode of every running row
and samples the same tokens. Rank 0 also runs the HTTP API (``api.py``, FastAPI + uvicorn in a
thread), which never touches a tensor: requests go in through a thread-safe queue and text comes
back through per-request asyncio queues (``bridge.py``). Needs the ``serve`` extra
(``pip install -e '.[serve]'``).
"""
