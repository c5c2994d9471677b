"""Who may call what over HTTP: API keys (api_keys.py) and CORS (cors.py).

Shared by the serving server (slotserver.server) and the router (slotserver.router), and so kept
free of torch: a router process loads no model, and `slotserver.server` imports the engine.
Only the standard library, starlette and slotserver.errors are imported here.
"""
