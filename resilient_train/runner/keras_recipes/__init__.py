"""Keras, turned into recipes: a compiled model (``compiled``), a ``model.fit`` script run unchanged
(``fitscript``), and the callbacks the custom loop runs with state that survives kills (``callbacks``).

Named so that nothing here shadows the ``keras`` package.
"""
