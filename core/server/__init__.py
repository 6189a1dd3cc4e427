"""The engine as a service: `python -m core.server` (OpenAI-compatible routes, Prometheus
metrics, the dashboard's state routes). This package file imports nothing, so a client can
import `core.observe.wire` without FastAPI; `core.server.app.create_app` builds the app."""
