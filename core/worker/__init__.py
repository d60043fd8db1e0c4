"""The worker runtime: what runs inside every training process.

``api`` is the session (``init`` / ``shutdown``, rank and size) and the data-plane front the
plugins build on (``push_pull_raw``, ``push_pull_inplace_id``, handles); around it, the
buffer protocol adapters (``buffers``), compression choices (``compression``), the
framework-free checks of the training algorithms' arguments (``algorithm_args``), tensor fusion
plans (``fusion_plan``), quorum catch-up (``catch_up``), asynchronous training
(``async_mode``), the host topology (``topology``), the stall inspector's worker side
(``stall``) and the rerouting client over elastic servers (``rerouting``). The C++ core
(``fastps._core``) does the moving; nothing here knows a framework.
"""
