"""The job endpoint keeps serving the final state for its linger time, then closes."""

from __future__ import annotations


def test_the_endpoint_closes_after_its_linger_time() -> None:
    import socket
    import time

    from epochstream.deploy.endpoint import JobEndpoint

    endpoint = JobEndpoint(object(), host="127.0.0.1", token="t")
    endpoint.start()
    host, port = endpoint.url.removeprefix("http://").split(":")
    endpoint.close_after(0.2)
    socket.create_connection((host, int(port)), timeout=5).close()  # still serving
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except ConnectionRefusedError:
            break
        except ConnectionResetError:
            pass  # accepted into the backlog as the listener closed: try again
        assert time.monotonic() < deadline, "the endpoint never closed"
        time.sleep(0.05)
    assert endpoint.login_url().startswith(endpoint.url + "/dashboard/login?code=")
