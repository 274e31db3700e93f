"""The nodes of each while loop's body in an export's `serving_default` graph, and whether
two exports' counts are equal op type by op type: `python bench/profiling.py --nodes`
(its docstring says what is counted). Not timed.
"""

import collections

import common


WHILE_OPS = ("While", "StatelessWhile")


def called(node, library) -> list:
    """[(attr, function name)] of the library functions a node calls (a call's f, an If's
    branches, a While's cond and body)."""
    calls = []
    for attr, value in sorted(node.attr.items()):
        names = [value.func.name] if value.func.name else [f.name for f in value.list.func]
        calls += [(attr, name) for name in names if name in library]
    return calls


def while_bodies(graph_def):
    """({path: body function name} of every while loop reached from the graph's nodes
    through the functions they call, the library {name: FunctionDef}). A path names the
    nodes from the graph down to the loop, each call's attr in brackets
    ("StatefulPartitionedCall[f]/cond[then_branch]/cond/while"): the code's name scopes,
    which two exports of the same code share, unlike the functions' numbered names."""
    library = {f.signature.name: f for f in graph_def.library.function}
    bodies = {}

    def walk(nodes, prefix):
        for node in nodes:
            for attr, name in called(node, library):
                path = prefix + node.name
                if node.op in WHILE_OPS and attr == "body":
                    bodies[path] = name
                walk(library[name].node_def, f"{path}[{attr}]/")
    walk(graph_def.node, "")
    return bodies, library


def op_counts(nodes, library) -> collections.Counter:
    """Nodes by op type, those of the functions they call (recursively) included."""
    counts = collections.Counter(node.op for node in nodes)
    for node in nodes:
        for _, name in called(node, library):
            counts.update(op_counts(library[name].node_def, library))
    return counts


def measure_nodes(path) -> dict:
    """{loop path: (the body's own nodes, {op type: nodes} with the functions it calls)} of
    each while loop of an export's serving_default, and "whole signature" for every node
    its graph reaches."""
    from trainer.serving import saved_model
    graph_def = saved_model.load(path).signatures["serving_default"].graph.as_graph_def()
    bodies, library = while_bodies(graph_def)
    counts = {loop: (len(library[name].node_def), op_counts(library[name].node_def, library))
              for loop, name in bodies.items()}
    counts[WHOLE] = (len(graph_def.node), op_counts(graph_def.node, library))
    return counts


# measure_nodes' row of the signature's graph: its own nodes, and every function it reaches.
WHOLE = "the signature's graph"


def print_node_tables(exports):
    """exports: [(label, measure_nodes' counts)]: the totals per loop, whether the exports'
    op-type counts are equal, then the nodes by op type."""
    loops = list(dict.fromkeys(loop for _, counts in exports for loop in counts))
    loops = [loop for loop in loops if loop != WHOLE] + [WHOLE]
    names = {loop: f"loop {i}" for i, loop in enumerate(loops[:-1], 1)}
    names[WHOLE] = "whole signature"

    def cell(counts, loop, own):
        if loop not in counts:
            return "-"
        return str(counts[loop][0] if own else sum(counts[loop][1].values()))

    rows = []
    for loop in loops:
        found = [counts[loop][1] for _, counts in exports if loop in counts]
        equal = ("-" if len(exports) == 1 else
                 "yes" if len(found) == len(exports) and all(c == found[0] for c in found)
                 else "**no**")
        rows.append([names[loop], loop, *(cell(counts, loop, True) for _, counts in exports),
                     *(cell(counts, loop, False) for _, counts in exports), equal])
    common.print_table(
        ["loop", "path (the nodes down to it, each call's attr in brackets)",
         *(f"{label}: body nodes" for label, _ in exports),
         *(f"{label}: with the functions it calls" for label, _ in exports),
         "equal by op type"], rows, text_columns=[0, 1, 2 + 2 * len(exports)],
        title="**serving_default's while loops: nodes of each body, alone and with the "
              "functions it calls (its If branches), and whether the exports' counts are "
              "equal op type by op type**")
    loops = loops[:-1]
    op_types = collections.Counter()
    for _, counts in exports:
        for loop in loops:
            op_types.update(counts.get(loop, (0, collections.Counter()))[1])
    rows = []
    for op_type, _ in op_types.most_common():
        cells = [[str(counts[loop][1][op_type]) if loop in counts else "-"
                  for _, counts in exports] for loop in loops]
        rows.append([op_type, *(n for loop_cells in cells for n in loop_cells),
                     "-" if len(exports) == 1 else
                     "yes" if all(len(set(c)) == 1 for c in cells) else "**no**"])
    common.print_table(
        ["op type", *(f"{names[loop]}, {label}" for loop in loops for label, _ in exports),
         "equal"], rows, text_columns=[0, 1 + len(loops) * len(exports)],
        title="**serving_default's while-loop bodies by op type, each with the functions it "
              "calls**")


def count_nodes(args):
    exports = [("this", args.saved_model)] + ([("compare", args.compare)] if args.compare
                                              else [])
    measured = [(label, measure_nodes(path)) for label, path in exports]
    common.print_header([
        ("machine", common.describe()),
        ("versions", common.versions()),
        ("this", args.saved_model),
        ("compare", args.compare or "-"),
        ("command", common.command()),
    ])
    print_node_tables(measured)
