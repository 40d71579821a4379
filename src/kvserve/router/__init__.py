"""Router mode: kvserve started without a model serves several, one child process each.

``catalog`` (which models exist), ``pool`` (the child processes and their status), ``app``
(llama-server's router API and the proxy to the children), ``serve`` (start-up).
"""
