"""The stages of ``llmc build``, each a function of the previous stage's typed artifact.

    load.resolve       SourceOptions -> ResolvedModel        (files, tokenizer, digest)
    load.load          ResolvedModel -> LoadedModel          (float32 weights, KV geometry)
    export.export      LoadedModel -> FloatGraph             (plugin nodes, graph passes)
    quantize.quantize  FloatGraph -> EngineGraph             (Q/DQ nodes, with --quant)
    lower.lower_cpu    EngineGraph -> LoweredEngine          (ORT segments for this host)
    report.report_cpu  LoweredEngine -> EngineReport         (accuracy, provider choice)
    manifest           ... -> manifest.json                  (``core_facts``: shared fields)
    publish.publish    engine directory -> IndexEntry        (with --registry)

``llmc.compiler.build`` runs them for the cpu target; ``llmc.compiler.backends.tensorrt.gpu_build``
runs
the same ones up to the engine graph, then its own TensorRT lowering and portable stage.
"""
