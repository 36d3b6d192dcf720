"""``torchtrt-dist serve``: an OpenAI-compatible server over the tensor / expert-parallel ranks.

The ranks run the generation core (``generation/core.py``) in step: rank 0's scheduler plans
each step (admissions, prefill chunks, preemptions, cancels: ``generation/scheduler.py``) and
announces the plan on a control channel (``control.py``); every rank then applies it to its
paged KV cache, runs the same rows and samples the same tokens. Rank 0 also runs the HTTP API
(``api.py``, FastAPI + uvicorn in a thread), which never touches a tensor: requests go in
through a thread-safe queue and text comes back through per-request asyncio queues
(``bridge.py``). Needs the ``serve`` extra (``pip install -e '.[serve]'``).
"""
