"""How the e-graph is built and the written graph chosen: equality saturation (``runner``), the searches
(``mcts``, ``backtrack``, what they share in ``result``) and the measured choice among extracted
candidates (``candidates``).
"""
