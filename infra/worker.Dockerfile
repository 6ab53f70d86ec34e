# The worker image: epiflow on CPython 3.11, at the versions requirements/lock.txt pins.
# EXTRAS picks what the worker runs: `collect` (collection and QC: no torch, TRL or
# transformers, about 0.8 GB), `all` (also training and evaluation, about 2 GB).
FROM python:3.11-slim
ARG EXTRAS=collect
WORKDIR /opt/epiflow
COPY . .
# torch first, from the CPU index and only when training is in: left to a resolver, PyPI's
# default Linux wheel is a multi-GB CUDA build. uv then keeps the torch it finds.
RUN pip install --no-cache-dir -c requirements/lock.txt uv \
 && if echo ",${EXTRAS}," | grep -qE ',(train|all),'; then \
      pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0; \
    fi \
 && uv pip install --system --no-cache --compile-bytecode -c requirements/lock.txt ".[${EXTRAS}]"
