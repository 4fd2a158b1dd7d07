#include "tdc/pipelining/schedule_ir.h"
