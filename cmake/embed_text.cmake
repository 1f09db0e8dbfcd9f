# Writes OUTPUT, a C++ source defining `const char* NAME()` that returns the text of INPUT, so
# that a file the program serves (the dashboard page) is part of the executable.
# Usage: cmake -DINPUT=... -DOUTPUT=... -DNAME=... -P embed_text.cmake
file(READ "${INPUT}" text HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${text}")
file(WRITE "${OUTPUT}"
     "// Generated from ${INPUT} at build time; edit that file instead.\n"
     "namespace { const unsigned char bytes[] = {${bytes} 0}; }\n"
     "const char* ${NAME}() { return reinterpret_cast<const char*>(bytes); }\n")
