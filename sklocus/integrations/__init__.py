"""sklocus inside the tools that already carry a team's traffic.

:mod:`sklocus.integrations.litellm` routes inside LiteLLM's ``Router``: a routing
plugin keeps, among the models LiteLLM may send a request to, the one a LOCUS
router finds likeliest to answer it (under its policy of cost).
"""
