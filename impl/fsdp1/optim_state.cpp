// FSDP1 optimizer state dicts (fully_sharded_data_parallel.h). Being written (issue 15).
#include "tdc/fsdp1/fully_sharded_data_parallel.h"
