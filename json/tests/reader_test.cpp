// tdc::json::Reader ([Note: one JSON reader]): every accessor's value and every error's wording.
#include <stdexcept>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <tdc/json/reader.h>

namespace {

using nlohmann::json;
using tdc::json::Reader;
using testing::HasSubstr;

struct DocError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The message of the DocError `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const DocError& e) {
    return e.what();
  }
  return "";
}

const json kDoc = json::parse(R"({
  "name": "a", "empty": "", "n": 3, "big": 18446744073709551615, "x": 0.5, "flag": true, "none": null,
  "list": [1, 2, 3], "names": ["p", "q"], "mesh": {"shape": [2, 2], "dims": ["dp", 7]}, "rows": [{"k": 1}, 5]
})");

TEST(JsonReader, ReadsEachTypeAndDefaults) {
  Reader<DocError> r(kDoc, "doc 'a.json'");
  EXPECT_EQ(r.string("name"), "a");
  EXPECT_EQ(r.string("name", {"a", "b"}), "a");
  EXPECT_EQ(r.string("empty", {}, /*may_be_empty=*/true), "");
  EXPECT_EQ(r.string_or("missing", "d"), "d");
  EXPECT_EQ(r.string_or("none", "d"), "d");  // null is "not given"
  EXPECT_EQ(r.integer("n", 1, 4), 3);
  EXPECT_EQ(r.integer_or("missing", 7), 7);
  EXPECT_EQ(r.opt_integer("none"), std::nullopt);
  EXPECT_EQ(r.opt_integer("n"), 3);
  EXPECT_DOUBLE_EQ(r.number("x", 0), 0.5);
  EXPECT_DOUBLE_EQ(r.number("n"), 3.0);
  EXPECT_DOUBLE_EQ(r.number_or("missing", 1.5), 1.5);
  EXPECT_TRUE(r.boolean("flag"));
  EXPECT_FALSE(r.boolean_or("missing", false));
  EXPECT_EQ(r.integers("list", 0, 9), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(r.strings("names"), (std::vector<std::string>{"p", "q"}));
  EXPECT_EQ(r.object("mesh").integers("shape"), (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(r.array_or_empty("missing").empty());
  EXPECT_FALSE(r.object_or_empty("missing").has("anything"));
  const json& rows = r.array("rows");
  EXPECT_EQ(r.object_at("rows", rows, 0).integer("k"), 1);
}

TEST(JsonReader, ErrorsNameDocumentPathAndValue) {
  Reader<DocError> r(kDoc, "doc 'a.json'");
  EXPECT_EQ(error_of([&] { r.string("missing"); }), "doc 'a.json': missing field 'missing'");
  EXPECT_EQ(error_of([&] { r.string("n"); }), "doc 'a.json': field 'n': must be a string (value: 3)");
  EXPECT_EQ(error_of([&] {
              r.string("name", {"b", "c"});
            }),
            "doc 'a.json': field 'name': unknown value (known: b, c) (value: \"a\")");
  EXPECT_EQ(error_of([&] { r.string("empty"); }), "doc 'a.json': field 'empty': must not be empty (value: \"\")");
  EXPECT_EQ(error_of([&] { r.integer("n", 4, 8); }), "doc 'a.json': field 'n': must be an integer in 4..8 (value: 3)");
  EXPECT_EQ(error_of([&] { r.integer("x"); }), "doc 'a.json': field 'x': must be an integer (value: 0.5)");
  EXPECT_THAT(error_of([&] { r.integer("big"); }), HasSubstr("field 'big': must be an integer"));
  EXPECT_EQ(error_of([&] { r.number("x", 1); }), "doc 'a.json': field 'x': must be >= 1 (value: 0.5)");
  EXPECT_EQ(error_of([&] { r.number("name"); }), "doc 'a.json': field 'name': must be a number (value: \"a\")");
  EXPECT_EQ(error_of([&] { r.boolean("n"); }), "doc 'a.json': field 'n': must be true or false (value: 3)");
  EXPECT_EQ(error_of([&] { r.boolean("none"); }), "doc 'a.json': missing field 'none'");  // null is not a value
  EXPECT_EQ(error_of([&] { r.object("mesh").strings("dims"); }),
            "doc 'a.json': field 'mesh.dims[1]': must be a string (value: 7)");
  EXPECT_EQ(error_of([&] { r.integers("names"); }),
            "doc 'a.json': field 'names[0]': must be an integer (value: \"p\")");
  EXPECT_EQ(error_of([&] { r.array("name"); }), "doc 'a.json': field 'name': must be a list (value: \"a\")");
  EXPECT_EQ(error_of([&] { r.object("name"); }), "doc 'a.json': field 'name': must be a JSON object (value: \"a\")");
  const json& rows = r.array("rows");
  EXPECT_EQ(error_of([&] { r.object_at("rows", rows, 1); }),
            "doc 'a.json': field 'rows[1]': must be a JSON object (value: 5)");
  EXPECT_EQ(error_of([&] { Reader<DocError>(json::array(), "doc 'b.json'"); }),
            "doc 'b.json': must be a JSON object (value: [])");
  EXPECT_EQ(error_of([&] { r.object("mesh").fail("has 2 dims for 3 names"); }),
            "doc 'a.json': field 'mesh': has 2 dims for 3 names");
}

TEST(JsonReader, RefusesUnknownKeysOnlyAfterReadingTheRest) {
  const json j = {{"a", 1}, {"b", 2}, {"typo", 3}};
  Reader<DocError> r(j, "doc");
  r.integer("a");
  r.integer_or("b", 0);
  EXPECT_EQ(error_of([&] { r.no_unknown_keys(); }), "doc: field 'typo': unknown field (value: 3)");
  r.has("typo");
  EXPECT_EQ(error_of([&] { r.no_unknown_keys(); }), "");
}

TEST(JsonReader, ShownValuesAreBoundedAndNeverThrow) {
  EXPECT_EQ(tdc::json::shown(json(std::string(200, 'x'))).size(), 83u);  // 80 + "..."
  const json bad = std::string("\xff\xfe");                              // not UTF-8
  EXPECT_NO_THROW(tdc::json::shown(bad));
  const json doc = {{"s", bad}};
  Reader<DocError> r(doc, "doc");
  EXPECT_THAT(error_of([&] { r.integer("s"); }), HasSubstr("field 's': must be an integer"));
}

}  // namespace
