// A file that breaks libtdc's layering three ways, for CTest tdc_layering_check_detects.
#include <gtest/gtest.h>

#include "../fsdp/param.h"
#include "tdc/fsdp/fully_shard.h"
