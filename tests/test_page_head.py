"""ui/page_head.py: the page's early script goes first into the <head> of the app's own page, and nowhere else.

The browser side (Gradio's status timers go through the script, and an idle page asks for no frames) is
tests/test_app_browser.py::test_an_idle_page_asks_for_no_frames.
"""
import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from ui import page_head

PAGE = '<!doctype html><html><HEAD lang="en"><meta charset="utf-8"></HEAD><body>ok</body></html>'
TAG = f"<script>{page_head.PAGE_JS}</script>"


def client(routes) -> TestClient:
    return TestClient(Starlette(routes=routes, middleware=page_head.middleware()))


def test_the_script_goes_first_into_the_head():
    assert page_head.with_script(b"<html><head><title>t</title></head></html>", "S") == \
        b"<html><head><script>S</script><title>t</title></head></html>"
    assert page_head.with_script(b"<html><Head id=x>", "S") == b"<html><Head id=x><script>S</script>"
    assert page_head.with_script(b"<html><header>no head element</header></html>", "S") == \
        b"<html><header>no head element</header></html>"                  # <header> is not <head>: unchanged


def test_the_page_gets_it_with_a_right_length():
    response = client([Route("/", lambda request: HTMLResponse(PAGE))]).get("/")
    assert response.status_code == 200
    assert response.text == PAGE.replace('<HEAD lang="en">', '<HEAD lang="en">' + TAG)
    assert int(response.headers["content-length"]) == len(response.content)


def test_a_page_sent_in_pieces_gets_it_once():
    async def pieces():
        for piece in (PAGE[:20], PAGE[20:40], PAGE[40:]):
            yield piece.encode()

    response = client([Route("/", lambda request: StreamingResponse(pieces(), media_type="text/html"))]).get("/")
    assert response.text.count(TAG) == 1 and response.text.replace(TAG, "") == PAGE


@pytest.mark.parametrize("path, make", [
    ("/other", lambda request: HTMLResponse(PAGE)),                                  # not the app's page
    ("/", lambda request: JSONResponse({"html": PAGE})),                             # not HTML
    ("/", lambda request: Response(PAGE.encode(), media_type="text/html",
                                   headers={"content-encoding": "identity"})),      # already encoded: left alone
])
def test_everything_else_passes_untouched(path, make):
    response = client([Route(path, make)]).get(path)
    assert TAG not in response.text and (PAGE in response.text or '"html"' in response.text)


def test_a_post_passes_untouched():
    response = client([Route("/", lambda request: HTMLResponse(PAGE), methods=["POST"])]).post("/")
    assert response.text == PAGE


def test_each_launch_gets_its_own_options():
    from ui import layout                # not app.py: importing it starts loading the default model
    first, second = layout.launch_options(), layout.launch_options()
    assert first["app_kwargs"] is not second["app_kwargs"]       # Gradio writes into the dict it is given
    assert [m.cls for m in first["app_kwargs"]["middleware"]] == [page_head.EarlyScript]
