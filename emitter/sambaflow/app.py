"""The fixed parts of every bundle's compile.py, as a real module: a SambaFlow app that compiles
the bundle's model.py for the RDU and runs it.

The emitter copies `add_args` and `main` verbatim into compile.py, which binds `bundle` to its
model.py module; the tests bind it to a bundle's module and call them. Every line that touches the
vendor SDK carries the TEMPLATE mark: nobody here has run it (facts in docs/ARCHITECTURE.md).
"""

import torch

bundle = None  # compile.py: the bundle's model.py module


def add_args(parser):
    """The app's own arguments beside SambaFlow's."""
    parser.add_argument("--weights", default=None, help="directory of <var>.f64 / <var>.f32 files")


def main(argv=None):
    """`compile` or `run` the bundle's program through SambaFlow (a SambaNova host only)."""
    try:
        from sambaflow import samba  # TEMPLATE — SambaFlow API unverified
        import sambaflow.samba.utils as utils  # TEMPLATE — SambaFlow API unverified
        from sambaflow.samba.utils.argparser import parse_app_args  # TEMPLATE — SambaFlow API unverified
        from sambaflow.samba.utils.pef_utils import get_pefmeta  # TEMPLATE — SambaFlow API unverified
    except ImportError:
        raise SystemExit("compile.py needs SambaNova's SambaFlow SDK (a SambaNova host); "
                         "model.py runs anywhere torch does")
    args = parse_app_args(argv=argv, common_parser_fn=add_args)  # TEMPLATE — SambaFlow API unverified
    weights = bundle.load_weights(args.weights) if args.weights else {}
    model = bundle.LogosModule(weights, torch.float32)
    samba.from_torch_model_(model)  # TEMPLATE — SambaFlow API unverified
    inputs = [samba.from_torch_tensor(getattr(model, "leaf_" + n), name=n)  # TEMPLATE — SambaFlow API unverified
              for n in bundle.INPUTS]
    if args.command == "compile":
        samba.session.compile(model, inputs, None, name=args.pef_name or bundle.PROGRAM,  # TEMPLATE — SambaFlow API unverified
                              app_dir=args.output_folder, config_dict=vars(args),  # TEMPLATE — SambaFlow API unverified
                              pef_metadata=get_pefmeta(args, model))  # TEMPLATE — SambaFlow API unverified
    elif args.command == "run":
        utils.trace_graph(model, inputs, None, pef=args.pef, mapping=args.mapping)  # TEMPLATE — SambaFlow API unverified
        outputs = samba.session.run(input_tensors=inputs, output_tensors=model.output_tensors,  # TEMPLATE — SambaFlow API unverified
                                    section_types=["fwd"])  # TEMPLATE — SambaFlow API unverified
        out = samba.to_torch(outputs[0])  # TEMPLATE — SambaFlow API unverified
        print(bundle.OUTPUT, tuple(out.shape))
