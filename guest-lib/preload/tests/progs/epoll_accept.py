"""The shape of lighttpd and most event-driven servers, over ulnic: one
epoll set that holds a non-blocking listener, connections accepted into
the same set, each answered when its request arrives and closed at EOF.
The set sleeps with no timeout, so a request whose arrival does not wake
it hangs the server (the test's deadline fails it): no timer can find it.

serve PORT N: serves N connections, prints "ready" first and "served N"
at the end. fetch ADDR PORT N: N connections, one request each, every
reply checked, prints "fetched N".
"""
import select
import socket
import sys


def serve(port, n):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(64)
    listener.setblocking(False)
    ep = select.epoll()
    ep.register(listener.fileno(), select.EPOLLIN)
    conns, served = {}, 0
    print("ready", flush=True)
    while served < n:
        for fd, _ in ep.poll(-1):
            if fd == listener.fileno():
                while True:
                    try:
                        c, _ = listener.accept()
                    except BlockingIOError:
                        break
                    c.setblocking(False)
                    conns[c.fileno()] = c
                    ep.register(c.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
                continue
            c = conns[fd]
            try:
                data = c.recv(4096)
            except BlockingIOError:
                continue
            if data:
                c.sendall(b"reply to " + data)
                c.shutdown(socket.SHUT_WR)
            else:
                ep.unregister(fd)
                c.close()
                del conns[fd]
                served += 1
    print("served", served, flush=True)


def fetch(addr, port, n):
    for i in range(n):
        c = socket.create_connection((addr, port), timeout=30)
        req = b"request %d" % i
        c.sendall(req)
        reply = b""
        while True:
            d = c.recv(4096)
            if not d:
                break
            reply += d
        assert reply == b"reply to " + req, reply
        c.close()
    print("fetched", n, flush=True)


if sys.argv[1] == "serve":
    serve(int(sys.argv[2]), int(sys.argv[3]))
else:
    fetch(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
