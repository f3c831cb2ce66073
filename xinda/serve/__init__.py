"""``xinda serve``: a REST server (FastAPI + uvicorn) that batches concurrent requests per model.

settings.py every server default, models.py loading model directories, schemas.py the JSON
contract, worker.py the per-model batching thread, tasks.py one library call per batch,
metrics.py Prometheus metrics, errors.py and middleware.py refusals, app.py the app factory.
"""
