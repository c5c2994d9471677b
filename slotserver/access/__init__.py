"""Who may call what over HTTP, and where: API keys (api_keys.py), CORS (cors.py), the API prefix
(api_prefix.py) and HTTPS (tls.py).

Shared by the serving server (slotserver.server) and the router (slotserver.router), and so kept
free of torch: a router process loads no model, and `slotserver.server` imports the engine.
Only the standard library, starlette and slotserver.errors are imported here.
"""
