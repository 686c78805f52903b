"""``selfattn serve``: the live app's web layer (FastAPI routes, run by uvicorn).

Imported only when ``selfattn serve`` runs or a test asks for ``create_app``: the rest
of selfattn never needs FastAPI. ``app.py`` maps each route onto one function of
``commands.live``; ``run.py`` starts the server, opens the browser and stops on Ctrl-C.
"""
