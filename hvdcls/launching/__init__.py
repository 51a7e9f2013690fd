"""How a job's processes start: the horovodrun and mpirun command lines hvdcls builds (launch),
hvdcls-horovodrun's cached build probe (horovodrun), the horovod.* settings as the HOROVOD_*
variables hvd.init() reads (horovod_env), tcmalloc preloaded by a re-execution (allocator), and
whether there is a GPU to ask for (gpu). Part of the core: no framework, no Horovod binding."""
