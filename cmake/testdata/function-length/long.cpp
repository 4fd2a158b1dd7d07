// A function of 62 lines (CTest tdc_function_length_check_detects): the check must name it.
// Braces in strings, characters and comments do not count: { {
const char* braces() { return "{{ {"; }
char brace() { return '{'; }

int long_function(int x) {
  int y = x;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  y += 1;
  return y;
}
