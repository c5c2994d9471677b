"""`slotserver top`: a live terminal monitor of a running slotserver.

Data path, one poll every `--interval` seconds:

    client.py  GET /health, /lab (and /props once per connection) -> `Poll` (never raises)
    model.py   `TopState.apply(poll)`: parse.py turns the JSON into rows, tolerating wrong shapes;
               track.py derives what needs two polls (tokens/s now, defrag moves, elapsed)
    render.py  `render(state, width, height)`: a pure function -> one rich renderable
    app.py     the rich `Live` loop; keys.py reads q / l / r without echo and restores the terminal

Nothing here imports torch or the engine: the monitor only speaks HTTP.
"""
