// fmt's compiled part, built once for all of tdc ([Note: fmt compiled once] in cmake/TdcDeps.cmake).
// The definitions come from LibTorch's own copy of fmt (format-inl.h beside the format.h every tdc
// TU includes), so the declarations and the definitions are one fmt version whatever LibTorch
// this build is against. format.h declares these templates `extern` when FMT_HEADER_ONLY is not
// defined; this file is where they are instantiated.
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {

template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;

}  // namespace detail
FMT_END_NAMESPACE
