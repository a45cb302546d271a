"""The compiled twin of the logprob hot path (gateway/logprobs/_fastpath.c); the rest of the
package is declared in pyproject.toml. `optional`: without a C compiler the install goes on and
the pure-Python code (identical results, several times slower) runs.

(Declared here rather than under [tool.setuptools.ext-modules], which setuptools still calls
experimental.)
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("gateway.logprobs._fastpath",
                             ["gateway/logprobs/_fastpath.c", "gateway/logprobs/_fastpath_json.c",
                              "gateway/logprobs/_fastpath_store.c", "gateway/logprobs/_fastpath_body.c"],
                             depends=["gateway/logprobs/_fastpath.h"], optional=True)])
