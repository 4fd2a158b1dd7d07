// placeholder: being written (issue 11)
#include <gtest/gtest.h>
TEST(Placeholder, BeingWritten) { EXPECT_TRUE(true); }
