"""The naive baseline server (benchmark configuration 4): FastAPI calling the model once per request.

This is the seeds' starting point: one process, one synchronous forward pass per request, no batching.
It reuses modelserver's Hugging Face model code so that the only difference measured is the batching.

    python -m bench.serving_naive --model-dir DIR --port 8000 [--num-threads N]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response


def build_app(model_dir: str, num_threads: int) -> FastAPI:
    import torch
    from modelserver.models.hf import HFModel

    if num_threads:
        torch.set_num_threads(num_threads)
    model = HFModel(Path(model_dir))
    model.load()
    app = FastAPI()

    @app.get("/v2/health/ready")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request) -> Response:
        doc = await request.json()
        texts = doc["inputs"][0]["data"]
        prepared = model.preprocess({"text": np.array(texts, dtype=object)})
        outputs = model.predict([p.payload for p in prepared])  # one forward pass per request
        emb = np.stack([o["embedding"] for o in outputs])
        return JSONResponse(
            {
                "model_name": name,
                "outputs": [
                    {
                        "name": "embedding",
                        "datatype": "FP32",
                        "shape": list(emb.shape),
                        "data": emb.ravel().tolist(),
                    }
                ],
            }
        )

    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--num-threads", type=int, default=0)
    a = p.parse_args()
    uvicorn.run(build_app(a.model_dir, a.num_threads), host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
