"""Voilà as ``python -m simlib live`` runs it: a closed or reloaded page shuts its kernel down at once.

Voilà's page already tells the server when it unloads (a POST to ``/voila/api/shutdown/<kernel>``
carrying the ``_xsrf`` cookie), but a stand-alone Voilà never sets that cookie, so the server
refuses the request and every reload leaves a kernel (about 250 MB with the panel's simulator
workers) running until the idle culler finds it. Here the notebook page sets the cookie; the
culler stays as the fallback for a browser that dies without unloading. Run as::

    python -m simlib.app.voila_server lessons/live.ipynb --port=8866   # any Voilà option
"""
from __future__ import annotations

from voila.app import Voila
from voila.tornado.handler import TornadoVoilaHandler


class _PageHandler(TornadoVoilaHandler):
    """Voilà's notebook page, setting the XSRF cookie the page's unload request must carry."""

    async def prepare(self) -> None:  # type: ignore[override]
        await super().prepare()
        self.xsrf_token  # noqa: B018 -- tornado sets the _xsrf cookie on first access


class SimlibVoila(Voila):
    """Voilà whose notebook page sets the XSRF cookie (configured as ``Voila``: the same options apply)."""

    def init_handlers(self) -> list:
        return [(h[0], _PageHandler, *h[2:]) if h[1] is TornadoVoilaHandler else h for h in super().init_handlers()]


main = SimlibVoila.launch_instance

if __name__ == "__main__":
    main()
