"""Writes TorchScript archives for torchscript_archive_test, with PyTorch as the reference.

Usage: torchscript_archives.py DIR. Writes into DIR:
  model.pt       a scripted model with attention, a norm, a loop and an assert, as torch.jit.save
                 writes it (code deflated, data stored)
  stored.pt      the same entries, all stored
  many.pt        the same plus 70,000 small entries: a zip64 end record
  graph_ops.txt  the operators of the model's inlined graph that its code names as calls
  all_ops.txt    every operator this PyTorch has
"""
import sys
import zipfile

import torch

# Operators LibTorch prints as Python syntax, not as calls: literals, attribute reads, control
# flow, tuples and lists, casts, indexing.
SYNTAX = {
    "aten::Bool", "aten::Int", "aten::Float", "aten::str", "aten::__getitem__",
    "prim::Constant", "prim::GetAttr", "prim::SetAttr", "prim::If", "prim::Loop",
    "prim::ListConstruct", "prim::ListUnpack", "prim::TupleConstruct", "prim::TupleUnpack",
    "prim::TupleIndex", "prim::DictConstruct", "prim::Uninitialized", "prim::unchecked_cast",
    "prim::isinstance", "prim::CallMethod", "prim::CallFunction", "prim::Return",
}


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 16)
        self.att = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        h = self.emb(x)
        a, _ = self.att(h, h, h)
        # A message that reads like a call: the reader must not take it for one.
        assert a.dim() == 3, "torch.not_an_op(x) in a string"
        for _step in range(2):
            a = torch.relu(a)
        return self.norm(a).transpose(1, 2).mean()


def graph_ops(module):
    kinds = set()

    def walk(block):
        for node in block.nodes():
            kinds.add(node.kind())
            for inner in node.blocks():
                walk(inner)

    walk(module.inlined_graph)
    return sorted(k for k in kinds if k not in SYNTAX)


def rewrite(source, target, compression, extra=0):
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", compression) as dst:
        names = src.namelist()
        root = names[0].split("/")[0]
        for name in names:
            dst.writestr(name, src.read(name))
        for i in range(extra):
            dst.writestr(f"{root}/extra/{i}", b"x")


def main():
    out = sys.argv[1]
    module = torch.jit.script(Block())
    module.save(f"{out}/model.pt")
    rewrite(f"{out}/model.pt", f"{out}/stored.pt", zipfile.ZIP_STORED)
    rewrite(f"{out}/model.pt", f"{out}/many.pt", zipfile.ZIP_DEFLATED, extra=70000)
    with open(f"{out}/graph_ops.txt", "w") as f:
        f.write("\n".join(graph_ops(torch.jit.load(f"{out}/model.pt"))) + "\n")
    with open(f"{out}/tensor_bytes.txt", "w") as f:
        f.write(f"{sum(t.numel() * t.element_size() for t in module.state_dict().values())}\n")
    with open(f"{out}/all_ops.txt", "w") as f:
        f.write("\n".join(sorted({s.name for s in torch._C._jit_get_all_schemas()})) + "\n")


if __name__ == "__main__":
    main()
