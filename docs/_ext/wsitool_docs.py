"""The documentation site's own Sphinx extension: pages generated from the code at build time.

Directives (use them inside ``{eval-rst}`` blocks of the MyST pages):

``.. wsitool-cli:: COMMAND``
    The reference of one ``wsitool`` command (or of the group, with no argument): the
    ``--help`` text exactly as ``COLUMNS=80 wsitool COMMAND --help`` prints it, then each
    argument and option from the click parameters (names, type, default, help).
    ``tests/test_docs.py`` checks the rendering against the real command's output.

``.. wsitool-modules:: PACKAGE``
    An ``automodule`` section for the package and for every module below it, found by
    walking the package, so a module added later gets its reference without editing
    the docs.  ``:exclude:`` takes sub-packages documented on a page of their own;
    ``:top-level:`` keeps only the plain modules directly in the package (not its
    sub-packages) and ``:no-package:`` leaves out the package's own docstring.

``.. wsitool-exit-codes::``
    The table of exception classes and exit codes that the CLI applies
    (:data:`wsitool.cli.console.EXIT_CODES`), in the order it checks them.

Cross-references (the docstrings hold about 700 roles, most to internal modules):

* A reference to a name that ``wsitool`` re-exports (``wsitool.slide.Slide``,
  ``wsitool.errors.TileDecodeError.path``) goes to the public page of that name
  (``wsitool.Slide``, ...); the internals pages leave such members out, so each object
  is described once.
* A relative module reference (``:mod:`.frames``` in ``wsitool.codec.associated``) means
  what a relative import would: ``wsitool.codec.frames``.
* napoleon reads the first line of an attribute's doc comment as ``type: text`` where
  it has a colon; wsitool's ``#:`` comments are prose (``#: Reads per worker before memory
  is measured: ...``), so a prefix that is not a type expression stays text
  (:func:`keep_prose_attributes`).
* A reference by a short name (``TileDecodeError``, ``Level.read``) that Python's own
  lookup does not resolve is looked up by suffix among wsitool's objects and resolved
  only where exactly one object matches; otherwise the warning stands and fails the build.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import typing

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

HELP_WIDTH = 80  # the COLUMNS the help text is rendered at (docs/conf.py sets the same)


def click_group():
    """The ``wsitool`` command group as click sees it (typer vendors click, so its classes
    are matched by name here, not imported)."""
    import typer

    from wsitool.cli import app

    return typer.main.get_command(app)


def command_paths(group=None, prefix: tuple[str, ...] = ()) -> list[str]:
    """Every command and sub-command of ``wsitool`` as a space-separated path (``"patches plan"``)."""
    group = click_group() if group is None else group
    out = []
    for name, cmd in group.commands.items():
        path = (*prefix, name)
        out.append(" ".join(path))
        if hasattr(cmd, "commands"):
            out += command_paths(cmd, path)
    return out


def find_command(path: str):
    """The click command of a space-separated command path, or None."""
    cmd = click_group()
    for word in path.split():
        cmd = getattr(cmd, "commands", {}).get(word)
        if cmd is None:
            return None
    return cmd


def help_text(command: str | None) -> str:
    """``wsitool [COMMAND...] --help`` rendered in-process at :data:`HELP_WIDTH` columns.

    Trailing spaces are removed from each line, and leading and trailing blank lines
    from the text (rich pads every line to the width).
    """
    from typer.testing import CliRunner

    from wsitool.cli import app

    args = (command.split() if command else []) + ["--help"]
    result = CliRunner().invoke(app, args, prog_name="wsitool", env={"COLUMNS": str(HELP_WIDTH)})
    if result.exit_code != 0:
        raise RuntimeError(f"wsitool {' '.join(args)} exited {result.exit_code}: {result.output}")
    return normalise_help(result.output)


def normalise_help(text: str) -> str:
    """Help text without trailing spaces on its lines or blank lines around it."""
    return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")


def is_argument(param) -> bool:
    """Whether a click parameter is a positional argument (else an option)."""
    return getattr(param, "param_type_name", "") == "argument"


def describe_type(param) -> str:
    """The parameter's value type as words ("integer >= 1", "one of rgb, rgba, raw", ...).

    Works with typer's own parameters (``type_descriptor``, typer 0.2x) and with click's
    (``type``), whichever the installed typer builds.
    """
    if not is_argument(param) and (getattr(param, "is_flag", False) or getattr(param, "is_bool_flag", False)):
        return "flag"
    desc = getattr(param, "type_descriptor", None)
    kind = getattr(param, "type", None)
    choices = getattr(desc, "choices", None) if getattr(desc, "is_choice", False) else getattr(kind, "choices", None)
    if choices:
        return "one of " + ", ".join(str(getattr(c, "value", c)) for c in choices)
    annotation = getattr(desc, "annotation", None)
    while typing.get_origin(annotation) is not None:  # List[Path], Tuple[int, int], Optional[int]
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0] if args else None
    name = getattr(annotation, "__name__", None) or getattr(kind, "name", None) or "text"
    name = {"int": "integer", "integer": "integer", "float": "number", "str": "text", "Path": "path",
            "bool": "boolean"}.get(name, name)
    low = getattr(param, "min", None) if desc is not None else getattr(kind, "min", None)
    high = getattr(param, "max", None) if desc is not None else getattr(kind, "max", None)
    bounds = [f">= {low}"] if low is not None else []
    bounds += [f"<= {high}"] if high is not None else []
    text = f"{name} {' and '.join(bounds)}".strip()
    nargs = getattr(param, "nargs", 1)
    if nargs and nargs > 1:
        text = f"{nargs} x {text}"
    elif nargs == -1:
        text = f"one or more, {text}"
    return text


class CliDirective(SphinxDirective):
    """``.. wsitool-cli:: [COMMAND [SUBCOMMAND]]``: help text and parameter list of one command."""

    optional_arguments = 2
    has_content = False

    def run(self) -> list[nodes.Node]:
        command = " ".join(self.arguments) or None
        text = help_text(command)
        block = nodes.literal_block(text, text, classes=["wsitool-help"])
        block["language"] = "text"
        out: list[nodes.Node] = [block]
        if command is None:
            return out
        cmd = find_command(command)
        if cmd is None:
            raise self.error(f"no wsitool command {command!r} (known: {', '.join(command_paths())})")
        items = nodes.definition_list(classes=["wsitool-params"])
        for param in cmd.params:
            if getattr(param, "hidden", False):
                continue
            items += self.param_item(param)
        out.append(items)
        return out

    def param_item(self, param) -> nodes.definition_list_item:
        """One definition-list entry: the parameter's names, then type, default and help."""
        if is_argument(param):
            names = [(param.metavar or param.name).upper()]
        else:
            names = list(param.opts) + list(param.secondary_opts)
        term = nodes.term()
        for i, name in enumerate(names):
            if i:
                term += nodes.Text(", ")
            term += nodes.literal(name, name)
        body = nodes.definition()
        facts = [describe_type(param)]
        if is_argument(param):
            facts.append("required argument" if param.required else "optional argument")
        elif param.required:
            facts.append("required")
        default = param.default
        if (not is_argument(param) and param.show_default is not False and default is not None
                and not callable(default) and not (param.is_flag and default is False)):
            facts.append(f"default {default if not isinstance(default, (list, tuple)) else ' '.join(map(str, default))}")
        help_words = " ".join((getattr(param, "help", None) or "").split())
        help_words = re.sub(r"\[default: [^\]]*\]", "", help_words).strip()
        para = nodes.paragraph()
        para += nodes.emphasis("", "; ".join(facts))
        if help_words:
            para += nodes.Text(". " + help_words)
        body += para
        return nodes.definition_list_item("", term, body)


class ModulesDirective(SphinxDirective):
    """``.. wsitool-modules:: PACKAGE``: automodule sections for a package and its modules."""

    required_arguments = 1
    option_spec = {"exclude": directives.unchanged, "no-package": directives.flag, "top-level": directives.flag}

    def run(self) -> list[nodes.Node]:
        package = self.arguments[0]
        excluded = tuple((self.options.get("exclude") or "").split())
        module = importlib.import_module(package)
        names = [] if "no-package" in self.options else [package]
        if hasattr(module, "__path__"):
            walk = pkgutil.iter_modules if "top-level" in self.options else pkgutil.walk_packages
            for info in sorted(walk(module.__path__, package + "."), key=lambda i: i.name):
                leaf = info.name.rsplit(".", 1)[1]
                if leaf.startswith("_") or any(info.name == x or info.name.startswith(x + ".") for x in excluded):
                    continue
                if "top-level" in self.options and info.ispkg:
                    continue
                names.append(info.name)
        lines: list[str] = []
        for name in names:
            lines += [f"``{name}``", "-" * (len(name) + 4), "", f".. automodule:: {name}", "   :members:",
                      "   :undoc-members:", "   :ignore-module-all:", "   :show-inheritance:", ""]
            mod = importlib.import_module(name)
            for const in undocumented_constants(mod):
                value = " ".join(repr(getattr(mod, const)).split())
                lines += [f".. py:data:: {const}", f"   :module: {name}"]
                lines += [f"   :value: {value}"] if len(value) <= 100 else []
                lines += [""]
            self.env.note_dependency(mod.__file__ or "")
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source=f"<wsitool-modules {package}>"), node)
        return node.children


def undocumented_constants(module) -> list[str]:
    """Public module-level names assigned in ``module``'s own source without a doc comment
    (``#:``) or docstring: autodoc leaves such data out even with ``:undoc-members:``, yet
    docstrings refer to them (``NO_CUDA``, ``PHI_KEYWORDS``, ``console``)."""
    import ast
    import inspect

    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return []
    lines = source.splitlines()
    body = ast.parse(source).body
    out = []
    for i, node in enumerate(body):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        after = body[i + 1] if i + 1 < len(body) else None
        documented = (
            (node.lineno >= 2 and lines[node.lineno - 2].strip().startswith("#:"))
            or "#:" in lines[node.lineno - 1]
            or (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str))
        )
        if documented:
            continue
        out += [t.id for t in targets if isinstance(t, ast.Name) and not t.id.startswith("_")
                and not (t.id in {"logger", "log"})]
    return out


class ExitCodesDirective(SphinxDirective):
    """``.. wsitool-exit-codes::``: the CLI's exception-to-exit-code table."""

    def run(self) -> list[nodes.Node]:
        from wsitool.cli.console import EXIT_CODES

        table = nodes.table(classes=["wsitool-exit-codes"])
        group = nodes.tgroup(cols=2)
        table += group
        group += nodes.colspec(colwidth=3)
        group += nodes.colspec(colwidth=1)
        head = nodes.thead()
        group += head
        head += self.row("exception class (checked in this order)", "exit code")
        body = nodes.tbody()
        group += body
        for cls, code in EXIT_CODES:
            module = cls.__module__
            name = cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
            body += self.row(name, str(code), literal=True)
        return [table]

    @staticmethod
    def row(left: str, right: str, literal: bool = False) -> nodes.row:
        row = nodes.row()
        for text, lit in ((left, literal), (right, False)):
            entry = nodes.entry()
            para = nodes.paragraph()
            para += nodes.literal(text, text) if lit else nodes.Text(text)
            entry += para
            row += entry
        return row


TYPE_WORD = re.compile(r"^[\w.\[\](),|*~`:-]+$")
JOINERS = {"or", "of", "and"}


def looks_like_type(text: str) -> bool:
    """Whether ``text`` reads as a type expression (``int``, ``list of str``, ``dict[str, int] or None``)
    rather than prose: no two plain words in a row unless joined by "or", "of", "and" or a comma."""
    words = text.split()
    if not words or not all(TYPE_WORD.match(w) for w in words):
        return False
    return all(a in JOINERS or b in JOINERS or a.endswith(",") for a, b in zip(words, words[1:]))


def keep_prose_attributes() -> None:
    """Make napoleon take an attribute's first line as a type only when it looks like one."""
    from sphinx.ext.napoleon.docstring import GoogleDocstring

    original = GoogleDocstring._consume_inline_attribute
    if getattr(original, "wsitool", False):
        return

    def consume(self):
        line = self._lines.get(0)
        if not isinstance(line, str):  # no lines left: napoleon's own handling
            return original(self)
        kind, colon, _rest = self._partition_field_on_colon(line)
        if colon and not looks_like_type(kind):
            self._lines.next()
            descs = [line, *self._dedent(self._consume_to_end())]
            return "", self.__class__(descs, self._config).lines()
        return original(self)

    consume.wsitool = True
    GoogleDocstring._consume_inline_attribute = consume


ATTRIBUTE_LINE = re.compile(r"^(\s+)(\w+(?:, \w+)+): (.*)$")


def split_attribute_names(app, what, name, obj, options, lines):
    """In an ``Attributes:`` section, ``width, height: text`` becomes one entry per name
    (napoleon would read ``width,`` as a type).  Runs before napoleon."""
    in_section = False
    indent = None
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped in ("Attributes:", "Fields:"):
            in_section, indent = True, len(line) - len(line.lstrip())
        elif in_section and stripped and len(line) - len(line.lstrip()) <= indent:
            in_section = False
        if in_section:
            match = ATTRIBUTE_LINE.match(line)
            if match:
                lead, names, text = match.groups()
                body = [text]
                j = i + 1
                while j < len(lines) and lines[j].strip() and len(lines[j]) - len(lines[j].lstrip()) > len(lead):
                    body.append(lines[j].strip())
                    j += 1
                entry = " ".join(body)
                lines[i:j] = [f"{lead}{n}: {entry}" for n in names.split(", ")]
                i += len(names.split(", "))
                continue
        i += 1


def public_names() -> dict[str, str]:
    """``{defining module.qualname: public name}`` for every name in ``wsitool.__all__``
    and ``wsitool.openslide.__all__`` that is defined elsewhere."""
    import wsitool
    import wsitool.openslide

    out: dict[str, str] = {}
    for package in (wsitool, wsitool.openslide):
        for name in package.__all__:
            obj = getattr(package, name)
            module = getattr(obj, "__module__", None)
            qualname = getattr(obj, "__qualname__", None)
            if module and qualname and module != package.__name__ and module.startswith("wsitool"):
                out[f"{module}.{qualname}"] = f"{package.__name__}.{name}"
    return out


PUBLIC = public_names()
def is_public_export(obj) -> bool:
    """Whether ``obj`` is a class or function documented on the public API pages."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    return bool(module and qualname and f"{module}.{qualname}" in PUBLIC)


def skip_public_in_internals(app, what, name, obj, skip, options):
    """Leave re-exported names out of the internals pages (they are on the public ones)."""
    if what == "module" and is_public_export(obj):
        return True
    return None


def lookup(target: str, module: str | None = None, cls: str | None = None, want_callable: bool = False):
    """The object a dotted ``target`` names, tried as given, then inside ``cls`` and ``module``;
    ``(full name, object)`` or None.  ``want_callable`` skips objects that are not callable
    (a ``:func:`` reference to ``memory_bound`` means the function, not a field of that name)."""
    candidates = [target]
    if module:
        if cls:
            candidates.append(f"{module}.{cls}.{target}")
        candidates.append(f"{module}.{target}")
    for name in candidates:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except Exception:  # noqa: BLE001 - not a module: try a shorter prefix
                continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            if want_callable and not callable(obj):
                break
            return name, obj
    return None


def public_target(target: str, module: str | None = None, cls: str | None = None,
                  want_callable: bool = False) -> str | None:
    """``target`` rewritten to the public name of its longest re-exported prefix, or None.

    Both the defining path (``wsitool.slide.Slide``) and a re-exporting one
    (``wsitool.export.export_pyramid``) count.
    """
    found = lookup(target, module, cls, want_callable)
    full = found[0] if found else target
    parts = full.split(".")
    for i in range(len(parts), 1, -1):
        prefix = ".".join(parts[:i])
        public = PUBLIC.get(prefix)
        if public is None:
            hit = lookup(prefix)
            if hit is not None and is_public_export(hit[1]):
                public = PUBLIC[f"{hit[1].__module__}.{hit[1].__qualname__}"]
        if public is not None:
            return ".".join([public, *parts[i:]])
    return None


# Names that type hints leave short (string annotations, aliases) and where each is documented.
EXTERNAL_ALIASES = {
    "Path": "pathlib.Path",
    "np.ndarray": "numpy.ndarray",
    "np.dtype": "numpy.dtype",
    "Dataset": "pydicom.dataset.Dataset",
    "_thread.allocate_lock": "threading.Lock",
    "asyncio.locks.Semaphore": "asyncio.Semaphore",
    "datetime": "datetime.datetime",
    "concurrent.futures._base.Future": "concurrent.futures.Future",
}


# Projects that publish no Sphinx inventory (docs/conf.py's nitpick_ignore_regex names them too).
NO_INVENTORY = {"typer", "tifffile", "rich", "torch"}


def canonical_name(obj) -> str | None:
    """``module.qualname`` where ``obj`` (a class or function) is defined, or None."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        return f"{module}.{qualname}"
    return None


def resolve_relative(app, doctree):
    """Turn ``:mod:`.name``` style references into the module a relative import would name."""
    from sphinx import addnodes

    for node in doctree.findall(addnodes.pending_xref):
        if node.get("refdomain") != "py" or not node.get("refspecific") or not node.get("py:module"):
            continue
        target = node["reftarget"]
        module = node["py:module"]
        parent = module.rsplit(".", 1)[0]
        try:
            is_package = hasattr(importlib.import_module(module), "__path__")
        except Exception:  # noqa: BLE001 - a module that does not import: leave the reference alone
            continue
        for base in ([module] if is_package else []) + [parent]:
            if lookup(f"{base}.{target}") is not None:
                node["reftarget"] = f"{base}.{target}"
                node["refspecific"] = False
                break


def resolve_missing(app, env, node, contnode):
    """Resolve wsitool references by public alias, private name or unique suffix (see above)."""
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    target = node["reftarget"]
    module, cls = node.get("py:module"), node.get("py:class")
    external = EXTERNAL_ALIASES.get(target)
    if external is None and target.startswith("typer._click."):  # typer vendors click
        external = "click." + target.rsplit(".", 1)[1]
    if external is not None:
        from sphinx.ext import intersphinx

        clone = node.deepcopy()
        clone["reftarget"] = external
        return intersphinx.missing_reference(app, env, clone, contnode)
    callable_role = node["reftype"] in ("func", "meth")

    def resolve(name: str, reftype: str | None = None):
        return domain.resolve_xref(env, node["refdoc"], app.builder, reftype or node["reftype"], name, node, contnode)

    public = public_target(target, module, cls, callable_role)
    if public is not None:
        hit = resolve(public)
        if hit is not None:
            return hit
    found = lookup(target, module, cls, callable_role)
    if found is not None:
        obj = found[1]
        if target.rsplit(".", 1)[-1].startswith("_"):
            return contnode  # a private name that exists: shown as code, not documented on purpose
        if isinstance(obj, typing.TypeVar):
            return contnode  # a type variable: nothing to link to
        canonical = canonical_name(obj)
        if canonical and canonical != found[0]:
            if canonical.startswith("wsitool"):
                hit = resolve(canonical)
                if hit is not None:
                    return hit
            else:  # another project's object reached through a wsitool module (a re-export)
                from sphinx.ext import intersphinx

                clone = node.deepcopy()
                clone["reftarget"] = canonical
                hit = intersphinx.missing_reference(app, env, clone, contnode)
                if hit is not None or canonical.split(".", 1)[0] in NO_INVENTORY:
                    return hit or contnode
        if canonical is None:  # data re-exported elsewhere (``wsitool.cli.EXIT_CODES``): the same object
            leaf = "." + found[0].rsplit(".", 1)[-1]
            same = [name for name in domain.objects if name.startswith("wsitool") and name.endswith(leaf)
                    and (hit := lookup(name)) is not None and hit[1] is obj]
            if len(same) == 1:
                hit = resolve(same[0])
                if hit is not None:
                    return hit
    if node["reftype"] == "attr" and found is None:
        # An instance attribute (set in __init__) is described in its class's Attributes
        # section, not as an object of its own: link to the class if it names it there.
        if "." in target:
            owner, attr = target.rsplit(".", 1)
        else:
            owner, attr = (f"{module}.{cls}" if module and cls else ""), target
        owner = public_target(owner) or owner
        hit = lookup(owner) if owner else None
        if hit is not None and isinstance(hit[1], type) and re.search(rf"\b{re.escape(attr)}\b", hit[1].__doc__ or ""):
            return resolve(hit[0], "class")
    types = domain.objtypes_for_role(node["reftype"]) or []
    suffix = "." + target.lstrip(".~")
    found = [name for name, entry in domain.objects.items()
             if name.startswith("wsitool") and name.endswith(suffix) and entry.objtype in types
             and not entry.aliased]
    if len(found) != 1:
        return None
    entry = domain.objects[found[0]]
    from sphinx.util.nodes import make_refnode

    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, found[0])


def setup(app):
    """Register the directives and the reference resolution."""
    app.add_directive("wsitool-cli", CliDirective)
    app.add_directive("wsitool-modules", ModulesDirective)
    app.add_directive("wsitool-exit-codes", ExitCodesDirective)
    app.connect("autodoc-skip-member", skip_public_in_internals)
    app.connect("autodoc-process-docstring", split_attribute_names, priority=400)
    app.connect("missing-reference", resolve_missing)
    app.connect("doctree-read", resolve_relative)
    keep_prose_attributes()
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
