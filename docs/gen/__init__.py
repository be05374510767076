"""The documentation's generated pages: references read from the code at build time.

``hooks.py`` is the MkDocs hook (``hooks:`` in mkdocs.yml) that puts them into the pages;
each other module renders one reference as Markdown: :mod:`.config_reference` from the
settings models, :mod:`.cli_reference` from the argument parser, :mod:`.dagster_reference`
from the code location's definitions, :mod:`.layout` (the development page's map of the
package) from its folders and docstrings.
"""
