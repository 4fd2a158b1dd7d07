// A shared library that is not a tdc backend plug-in: it lacks tdc_register_backends. The comm
// tests load it to check BackendRegistry::load_plugin's error message.
extern "C" int tdc_not_a_plugin() { return 42; }
